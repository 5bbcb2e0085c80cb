from exportkit.cli import main

main()
