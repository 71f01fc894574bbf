"""The DSpark drafter (kind `dspark`): the block drafter plus a Markov head, on the block family's code."""
