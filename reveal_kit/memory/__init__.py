"""REVEAL's offline memory (L1/L2/L3, text and visual channels): the store and its build."""
