import sys

from vradix.testing.gpu_aids import main

sys.exit(main())
