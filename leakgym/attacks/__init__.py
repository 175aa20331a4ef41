"""leakgym.attacks"""
