"""leakgym.bench"""
