"""The `ragen` command line: the one package that imports both the library (ragen/) and the pipeline (tasks/,
flows/). One module per command group; `cli.main` assembles them."""
