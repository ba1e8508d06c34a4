import sys

from rlkernels.cli import main

sys.exit(main())
