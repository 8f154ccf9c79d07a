"""Ceilings: datasheet peaks beside measured ones.

Metadata format (results.json -> metadata["ceilings"]):

    {
      "datasheet": {"tflops": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4,
                               "fp8": 1978.9},
                    "hbm_gbps": 3350.0, "l2_gbps": null}        # or null (CPU, unlisted GPU)
      "measured":  {"tflops": {"fp32": ..., "bf16": ...},     # classes that were measured
                    "hbm_gbps": ..., "l2_gbps": ..., "method": {...}, "measured_at": "..."}
                                                               # or null when not measured
    }

Rows use the datasheet value where there is one (peak_tflops, peak_gbps) and the
measured one beside it (meas_peak_tflops, meas_peak_gbps); a device without a datasheet
uses the measured values for both.
"""
