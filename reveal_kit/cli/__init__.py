"""The `reveal` command line: options and errors, then one module of commands per kind of work."""
