-- roofline_parts for one source alone, as stored at ingest in local_roofline (pipeline/local.py):
-- the view's rows (queries/views/82_roofline_parts.sql has the definitions and columns), computed
-- with the catalog peaks (no --peak-tflops).
SELECT * FROM roofline_parts;
