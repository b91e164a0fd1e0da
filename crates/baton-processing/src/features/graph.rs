//! The spec's two faces: the raw inputs a client sends, and the graph
//! inputs the transforms give, checked against the graph at load.

use baton_core::signature::{Signature, TensorSpec};

use super::FeatureSpec;
use super::error::FeatureError;

impl FeatureSpec {
    /// The raw inputs a client sends, one per feature in file order: the
    /// feature's datatype and shape `[-1]` (one value per row; `apply`
    /// also takes `[N, 1]`).
    pub fn inputs(&self) -> Vec<TensorSpec> {
        self.features
            .iter()
            .map(|f| TensorSpec { name: f.name.clone(), datatype: f.datatype, shape: vec![-1] })
            .collect()
    }

    /// The graph inputs the transforms give, in the order the file first
    /// names them: `[-1, width]`, or `[-1]` at rank 1.
    pub fn outputs(&self) -> Vec<TensorSpec> {
        self.graph_inputs
            .iter()
            .map(|g| {
                let width = i64::try_from(g.features.len()).unwrap_or(i64::MAX);
                let shape = if g.rank == 1 { vec![-1] } else { vec![-1, width] };
                TensorSpec { name: g.name.clone(), datatype: g.datatype, shape }
            })
            .collect()
    }

    /// The bytes of the graph inputs `apply` gives for `rows` rows
    /// (saturating): what a server counts against its memory budget before
    /// it transforms a request, since a feature left to its default costs
    /// nothing in the request and `width` elements per row in the output.
    pub fn output_bytes(&self, rows: usize) -> usize {
        self.graph_inputs
            .iter()
            .map(|g| rows.saturating_mul(g.features.len()).saturating_mul(g.datatype.size().unwrap_or(0)))
            .fold(0, usize::saturating_add)
    }

    /// Checks at load that the transforms give exactly the graph's inputs:
    /// every graph input given, nothing else, each with the graph's
    /// datatype, rank and width (a graph dimension of -1 takes any size).
    pub fn check_against(&self, graph: &Signature) -> Result<(), FeatureError> {
        let outputs = self.outputs();
        for want in &graph.inputs {
            if !outputs.iter().any(|o| o.name == want.name) {
                return Err(FeatureError::Mismatch(format!(
                    "the graph takes input '{}', which no feature's graph_input names",
                    want.name
                )));
            }
        }
        for given in &outputs {
            let Some(want) = graph.input(&given.name) else {
                let names: Vec<String> = graph.inputs.iter().map(|i| i.name.clone()).collect();
                return Err(FeatureError::Mismatch(format!(
                    "graph_input '{}': the graph has no such input; it takes {}",
                    given.name,
                    baton_core::signature::names(&names)
                )));
            };
            if want.datatype != given.datatype {
                return Err(FeatureError::Mismatch(format!(
                    "graph_input '{}': the graph takes {}, the features give {}",
                    given.name, want.datatype, given.datatype
                )));
            }
            let fits = want.shape.len() == given.shape.len()
                && want.shape.iter().zip(&given.shape).skip(1).all(|(w, g)| *w < 0 || w == g);
            if !fits {
                return Err(FeatureError::Mismatch(format!(
                    "graph_input '{}': the graph takes shape {:?}, the features give {:?} ({})",
                    given.name,
                    want.shape,
                    given.shape,
                    self.fed_by(&given.name)
                )));
            }
        }
        Ok(())
    }

    /// Which features feed a graph input, for messages.
    fn fed_by(&self, input: &str) -> String {
        let names: Vec<String> = self
            .graph_inputs
            .iter()
            .filter(|g| g.name == input)
            .flat_map(|g| g.features.iter().map(|&f| self.features[f].name.clone()))
            .collect();
        format!("features {}", baton_core::signature::names(&names))
    }
}
