"""walsvc.core: see ARCHITECTURE.md."""
