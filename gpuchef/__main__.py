from .commands.cli import main

if __name__ == "__main__":  # not when multiprocessing (spawn) imports it in a child
    main()
