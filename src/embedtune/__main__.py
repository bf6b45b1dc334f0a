import sys

from embedtune.cli import main

sys.exit(main())
