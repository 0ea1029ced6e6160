"""The `attnkit` command line: `attnkit.cli.main:main`, one module per verb group."""
