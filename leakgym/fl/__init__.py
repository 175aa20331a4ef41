"""leakgym.fl"""
