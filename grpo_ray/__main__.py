import sys

from grpo_ray.cli import main

sys.exit(main())
