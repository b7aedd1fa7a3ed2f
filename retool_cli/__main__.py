from retool_cli.cli import main

main()
