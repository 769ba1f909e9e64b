"""Issue 56, item 5: the generated attack harness. It walks the CLI's own argparse tree (``tree``), puts every option
and positional in a class by a table (``tree.CLASSES``), throws the standard hostile set of that class at it
(``values``), sampled with a seed so that every option gets at least two values and every (class, value) pair is
thrown somewhere (``plan``), and runs each case as the real command line, bounded and watched (``runner``). A new
option falls into a class with no new code; ``tests/unit/security/test_attack_harness.py`` drives it."""
