from perdure.cli import main

main()
