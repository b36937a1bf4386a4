"""Placeholder entrypoint; the trainer issue fills it in."""

import sys


def main() -> int:
    print("ddp_trainer: not implemented yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
