"""Dense Hessians: the chain of token curvatures (`chain`), the fold of the tape's nodes (`record`), the
assembly of the outer and functional terms (`assembly`) and stacks of blocks (`stack`).
"""
