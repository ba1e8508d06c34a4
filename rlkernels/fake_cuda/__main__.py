"""python -m rlkernels.fake_cuda: the same as python -m rlkernels fake-cuda."""

import sys

from rlkernels.fake_cuda.check import main

sys.exit(main())
