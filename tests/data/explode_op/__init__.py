"""A custom Data-Juicer operator for tests: raises on rows that contain a marker."""

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("explode_on_marker_mapper")
class ExplodeOnMarkerMapper(Mapper):
    def __init__(self, marker: str = "EXPLODE", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker = marker

    def process_single(self, sample):
        if self.marker in sample[self.text_key]:
            raise ValueError(f"row contains the marker {self.marker}")
        return sample
