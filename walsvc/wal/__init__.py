"""walsvc.wal: see ARCHITECTURE.md."""
