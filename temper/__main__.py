import sys

from temper.cli.main import main

sys.exit(main())
