"""The fleet of Sparks: this Spark's node in it, the backend that runs the fleet (Ray today) and
the status that joins the inventory with what the backend sees. Called by `sparkctl fleet`."""
