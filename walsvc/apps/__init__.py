"""walsvc.apps: see ARCHITECTURE.md."""
