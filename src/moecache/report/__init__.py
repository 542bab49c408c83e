"""The paper's outputs: the cost model of equation (1), the tables and the figures."""
