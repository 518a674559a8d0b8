"""The generator: candidate μGraphs for a program -- dimension labels, abstract expressions and
the subexpression oracle, elementwise templates, the block-level saturating search and the
kernel-level branch and bound, and the algebraic forms searched (docs/generator.md)."""
