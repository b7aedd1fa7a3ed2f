"""One module per subcommand: build objects from the typed config, call the core, write outputs."""
