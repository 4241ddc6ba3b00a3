"""Reading results: paired statistics with mapped coverage and corrections, and the paper's claims."""
