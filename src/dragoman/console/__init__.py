"""The operator console at /console: what its views show (`data`) and its pages."""
