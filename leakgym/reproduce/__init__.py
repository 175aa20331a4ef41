"""leakgym.reproduce"""
