"""The ROLL dialect: its key tables, transforms, context and derivations; ``translate`` is the entry point."""
