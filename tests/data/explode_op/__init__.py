"""A custom Data-Juicer operator for tests: raises on rows that contain a marker, until the
file `fixed_flag` exists (standing in for "the root cause was fixed")."""

import os

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("explode_on_marker_mapper")
class ExplodeOnMarkerMapper(Mapper):
    def __init__(self, marker: str = "EXPLODE", fixed_flag: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker = marker
        self.fixed_flag = fixed_flag

    def process_single(self, sample):
        if self.marker in sample[self.text_key] and not (self.fixed_flag and os.path.exists(self.fixed_flag)):
            raise ValueError(f"row contains the marker {self.marker}")
        return sample
