"""walsvc.read: see ARCHITECTURE.md."""
