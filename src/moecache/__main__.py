from moecache.cli import main

main()
