"""Commands: argparse and one `main(argv) -> int` per subcommand of `hang-watchdog`."""
