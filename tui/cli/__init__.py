"""tui/cli."""
