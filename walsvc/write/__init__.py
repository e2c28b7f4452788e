"""walsvc.write: see ARCHITECTURE.md."""
