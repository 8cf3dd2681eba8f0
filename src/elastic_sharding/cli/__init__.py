"""The command line: `parser` (the argparse parsers), `commands` (one function per command),
`main` (logging, dispatch, and the one place errors become exit codes)."""

from elastic_sharding.cli.main import entry, main, setup_logging
from elastic_sharding.cli.parser import build_parser

__all__ = ["build_parser", "entry", "main", "setup_logging"]
