//! `relay`, the developer and operator tool beside the platform: the `relay` binary (CLI,
//! `relay dev`, operator commands), the benchmarks, the chaos suite, and the local stand-ins they
//! and the tests start (a private Postgres cluster, a moto server, a throttling SES stand-in) with their clean-up.
//! None of this ships in a Lambda function.

pub mod bench;
pub mod chaos;
pub mod devinstance;
pub mod localaws;
pub mod pgcluster;
pub mod ses_standin;
pub mod watchdog;
