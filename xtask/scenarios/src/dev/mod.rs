//! The dev stack (`compose.yaml`): its images ([`images`]), and `cargo xtask dev up|status|
//! down|test` ([`stack`], [`checks`]). Everything reaches the containers through `docker
//! exec` ([`compose`]), never by connecting from the root namespace to a container address.

mod checks;
mod compose;
pub mod images;
mod python;
mod rootfs;
mod stack;
mod stream;

/// `meshwork-scenarios dev`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Build the images, start the stack, wait until every agent has every remote cluster
    /// ready, print `meshctl status` of every node.
    Up,
    /// The containers and `meshctl status` of every node.
    Status,
    /// Remove every container, network and volume of the stack, and its images.
    Down {
        /// Keep the images.
        #[arg(long)]
        keep_images: bool,
    },
    /// The stack from fresh images, the checks on it, then everything removed (also on
    /// failure).
    Test,
}

/// Runs a `dev` command.
pub fn run(command: &Command) -> anyhow::Result<()> {
    match command {
        Command::Up => stack::up(),
        Command::Status => stack::status(),
        Command::Down { keep_images } => stack::down(*keep_images),
        Command::Test => checks::run(),
    }
}
