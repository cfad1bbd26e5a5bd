"""Suite files: the run spec every part passes around, TOML loading with one-line errors, and suite expansion."""
