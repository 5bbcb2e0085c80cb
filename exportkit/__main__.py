from exportkit.entry import main

main()
