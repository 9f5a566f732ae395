"""The verl dialect: its key tables (by section), transforms and final passes; ``translate`` is the entry point."""
