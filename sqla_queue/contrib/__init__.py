"""contrib."""
