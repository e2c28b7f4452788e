"""walsvc.node: see ARCHITECTURE.md."""
