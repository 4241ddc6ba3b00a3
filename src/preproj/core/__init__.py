"""The method itself: its config, the two modules, the family table, attach/detach, adapter files, the fused loss."""
