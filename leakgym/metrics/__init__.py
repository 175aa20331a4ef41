"""leakgym.metrics"""
