"""leakgym.data"""
