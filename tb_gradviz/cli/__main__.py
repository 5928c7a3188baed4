"""`python -m tb_gradviz.cli`: the `tb-gradviz` command."""

import sys

from tb_gradviz.cli import main

sys.exit(main())
