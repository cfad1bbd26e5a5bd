"""The suite report: tables, statistics, plots, the network, pipeline and local sections, and the HTML page."""
