"""tui/sessions."""
