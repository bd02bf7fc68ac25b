import sys

from gdnzoo.cli import main

sys.exit(main())
