//! Where a fleet keeps its state in etcd, under `/baton/<cluster>/`:
//!
//! ```text
//! replicas/<id>             a live replica (under its lease)
//! desired/<model>           the version the fleet committed
//! record/<model>            the rollout in progress, or the last one
//! coordinator/<model>       who coordinates it (under its lease)
//! ack/<model>/<id>          a replica's prepare result (under its lease)
//! switched/<model>/<id>     when a replica switched
//! sums/<model>/<id>         what a replica observed during a step
//! ```
//!
//! Replicas watch only `record/` and `desired/`, so what other replicas
//! write (acks, sums) costs them nothing.

/// The key layout of one cluster.
#[derive(Clone, Debug)]
pub struct Keys {
    root: String,
}

impl Keys {
    /// The keys of cluster `name`.
    pub fn new(name: &str) -> Keys {
        Keys { root: format!("/baton/{name}/") }
    }

    /// Every key of the cluster.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The prefix of the replicas' registrations.
    pub fn replicas(&self) -> String {
        format!("{}replicas/", self.root)
    }

    /// One replica's registration.
    pub fn replica(&self, id: &str) -> String {
        format!("{}replicas/{id}", self.root)
    }

    /// The prefix of the committed versions.
    pub fn desired_all(&self) -> String {
        format!("{}desired/", self.root)
    }

    /// The version the fleet committed for `model`.
    pub fn desired(&self, model: &str) -> String {
        format!("{}desired/{model}", self.root)
    }

    /// The prefix of the rollout records.
    pub fn records(&self) -> String {
        format!("{}record/", self.root)
    }

    /// The rollout record of `model`.
    pub fn record(&self, model: &str) -> String {
        format!("{}record/{model}", self.root)
    }

    /// The prefix of the coordinator keys.
    pub fn coordinators(&self) -> String {
        format!("{}coordinator/", self.root)
    }

    /// Who coordinates the rollout of `model`.
    pub fn coordinator(&self, model: &str) -> String {
        format!("{}coordinator/{model}", self.root)
    }

    /// The prefix of the prepare results for `model`.
    pub fn acks(&self, model: &str) -> String {
        format!("{}ack/{model}/", self.root)
    }

    /// A replica's prepare result.
    pub fn ack(&self, model: &str, id: &str) -> String {
        format!("{}ack/{model}/{id}", self.root)
    }

    /// The prefix of the switch reports for `model`.
    pub fn switches(&self, model: &str) -> String {
        format!("{}switched/{model}/", self.root)
    }

    /// A replica's switch report.
    pub fn switched(&self, model: &str, id: &str) -> String {
        format!("{}switched/{model}/{id}", self.root)
    }

    /// The prefix of the observation sums for `model`.
    pub fn all_sums(&self, model: &str) -> String {
        format!("{}sums/{model}/", self.root)
    }

    /// A replica's observation sums.
    pub fn sums(&self, model: &str, id: &str) -> String {
        format!("{}sums/{model}/{id}", self.root)
    }

    /// The last part of a key: a replica's ID or a model's name.
    pub fn last(key: &str) -> &str {
        key.rsplit('/').next().unwrap_or(key)
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn keys_nest_under_the_cluster() {
        let keys = Keys::new("prod");
        assert_eq!(keys.record("ranker"), "/baton/prod/record/ranker");
        assert_eq!(keys.ack("ranker", "pod-1"), "/baton/prod/ack/ranker/pod-1");
        assert!(keys.ack("ranker", "pod-1").starts_with(&keys.acks("ranker")));
        assert!(!keys.ack("ranker2", "p").starts_with(&keys.acks("ranker")), "a model's prefix holds no other's");
        assert_eq!(Keys::last(&keys.replica("pod-7")), "pod-7");
    }
}
