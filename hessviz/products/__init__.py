"""Hessian-vector products: the tape (the one forward pass and its sweeps), the engines that run them
(closed form, lockstep, checkpointed, autograd) and the operator type they all answer to (`HessianOperator`).
"""
