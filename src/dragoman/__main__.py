from dragoman.cli import main

main()
